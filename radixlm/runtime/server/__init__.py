"""radixlm.runtime.server"""
