"""The folder Hugging Face's ``generate(custom_generate=...)`` loads ``generate.py`` from."""
