"""Framework to ONNX: torchvision models by name and any `module:factory` callable."""
