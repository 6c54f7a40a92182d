"""Built-in plans (YAML files in this folder), shipped by the built-in ``passes`` plugin."""
