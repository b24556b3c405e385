"""integration tests"""
