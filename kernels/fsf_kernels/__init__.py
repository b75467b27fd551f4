"""Triton kernels for fsframework.

The folder `kernels/` is installed under the import name `fsf_kernels` so it
cannot collide with the unrelated PyPI package `kernels`. Each op lives in its
own subpackage and takes exactly the tensors of its reference in
`fsframework.ops`.
"""
