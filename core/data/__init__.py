"""The owner's training data: documents in the field's formats, tokenizers, token shards
and the packed, resumable loader every trainer reads its own share with. Trainer-side
only: a volunteer's node never imports it."""
