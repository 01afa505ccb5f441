"""Batches (/v1/batches): read input files into lines, release lines to the request pipeline at a
fair pace, expire, and write the output and error files."""
