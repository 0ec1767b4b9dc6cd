"""Measured backends (ONNX Runtime, torch eager, the native executor) behind one interface."""
