"""An example team's command handlers for Rhumbatron."""
