"""radixlm.runtime.model"""
