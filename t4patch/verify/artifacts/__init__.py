"""`verify build`: do built libraries and binaries carry code for the target GPU architecture?"""
