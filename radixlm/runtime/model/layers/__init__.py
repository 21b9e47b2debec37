"""radixlm.runtime.model.layers"""
