"""The protocol's vocabulary, shared by every role that speaks it: signed messages
(receipts, contributions), RPC method names and error codes, and the DHT records of
versions. Below the libraries that use it (experts, moe, contributions, aggregator,
project); it imports nothing of theirs."""
