"""placeholder"""
def add_probe_arguments(parser, positive_int): pass
