"""radixlm.runtime.scheduler"""
