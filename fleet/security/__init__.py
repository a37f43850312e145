"""Trust boundaries: what comes from the operator, secret redaction, safe YAML.

The operator's decisions (`trust`) and the readers of their environment values
(`envvalues`), secrets out of every text (`redact`), bounded YAML (`yamlsafe`).
"""
