"""`fleet a2a`: the fleet as an A2A agent, on a2a-sdk's server (docs/a2a.md).

`card` builds the Agent Card (a skill per preset marked `a2a: true`, the bearer scheme);
`executor` maps A2A tasks to trees (SendMessage submits a root or answers the person it
waits on, CancelTask stops the tree, the answer comes back as an artifact); `app` puts
a2a-sdk's JSON-RPC routes and the card behind the bearer token.
"""
