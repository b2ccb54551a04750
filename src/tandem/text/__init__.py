"""The text edge: tokenizers, chat templates, stop strings, streaming detokenization.
The engine itself only sees token ids."""
