"""tallow-model-bert: BERT-family encoders (BERT, RoBERTa, XLM-RoBERTa) for embeddings.

The model code lives in :mod:`tallow_model_bert.model`; importing this package imports no torch.
"""

__version__ = "0.1.0"
