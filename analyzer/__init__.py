"""Loading, the graph IR, fusion passes, cost formulas and the CLI of onnxlens."""
