"""The retriever, its encoder and the Fisher-information module."""
