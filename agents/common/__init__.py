"""What the controller and the agents both import: the plan of a run, its wire format, and units."""
