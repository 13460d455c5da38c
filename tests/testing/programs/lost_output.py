"""Buffered rows never written: the program ends with ``os._exit``."""

import os

out = open("rows.txt", "w")
out.write("all 1000 rows\n")
os._exit(0)
