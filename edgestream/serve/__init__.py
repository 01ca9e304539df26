"""The assistant served over HTTP and WebSockets, with its web page."""
