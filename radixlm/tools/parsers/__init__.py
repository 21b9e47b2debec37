"""One module per model family's tool-call syntax (SGLang's --tool-call-parser names); registry.py picks one."""
