"""The live dashboard: pushes after commit over the channel layer, and the websockets."""
