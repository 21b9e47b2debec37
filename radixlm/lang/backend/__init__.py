"""radixlm.lang.backend"""
