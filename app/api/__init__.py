"""HTTP surfaces of blockq, one blueprint per module."""
