"""The voice assistant: streaming speech recognition, then an answer decoded by the LLM engine."""
