"""lockstep's Hydra configuration tree (config.yaml and its groups).

A package only so that a regular, non-editable install ships the YAML files
beside the code; ``controller.cli`` finds them through it.
"""
