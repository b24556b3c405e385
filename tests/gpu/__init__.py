"""gpu tests"""
