"""tallow-format-safetensors: Hugging Face model directories (config.json + *.safetensors) for tallow.

Other plugins may reuse :func:`tallow_format_safetensors.loader.load_directory`. Importing this
package imports no torch.
"""

__version__ = "0.1.0"
