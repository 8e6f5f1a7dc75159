"""Test stub (see stubs/README.md): not vLLM or SGLang."""
