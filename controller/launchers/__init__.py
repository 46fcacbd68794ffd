"""Launchers start the agent processes of a run: inprocess, local, ray, kubernetes (DESIGN §10).

Ray and Kubernetes are imported only inside their own modules, which load lazily.
"""
