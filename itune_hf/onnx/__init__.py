"""Captioners as ONNX graphs: `export.py` writes them (`itune export --format onnx`), `graphs.py` says what each
family's two graphs compute, `runtime.py` runs them with onnxruntime (`itune caption --runtime onnx`)."""
