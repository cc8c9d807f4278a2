"""The field's model families, as the trainer and the owner hold them (never a volunteer's
node: this package imports ``transformers``, the owner's extra).

A family's trainer-side layers are ``transformers``' own modules; its sparse blocks are
moehome's mixtures, whose experts are plain torch modules (core/experts) named one to one
as the family names them. ``export`` writes a folder that ``transformers`` loads;
``load`` reads one.

    routing.py   the grid gate, Mixtral's top-k weighting, the load-balancing loss
    mixtral.py   Mixtral-style models with a pluggable sparse block
    export.py    -> a Hugging Face folder (config, safetensors, tokenizer)
    load.py      <- a Hugging Face folder
    start.py     a project started from a Hugging Face folder (owner new --from)
"""
