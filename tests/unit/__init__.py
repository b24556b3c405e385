"""unit tests"""
