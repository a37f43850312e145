"""Conversations around a root: creating it, continuing or rewinding it, asking a person.

Owns root creation (`roots`), continue and rewind (`continuation`) and `ask_human` with its
reply and timeouts (`human`), and tool calls that wait for `fleet approve` (`approval`;
the `approve:` rules' schema is `fleet.config.approval_rules`).
"""
