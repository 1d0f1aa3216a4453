"""The Kafka protocol listener of a node: stock Kafka clients produce, fetch and join groups over it.

`listener` (asyncio TCP server and framing loop), `framing` (request and response frames, via kio),
`build` (kio response objects for any version), `apis` (the served APIs and versions, dispatch),
`settings` (brokers and cluster id from the node's configuration) and one module per API family.
"""
