"""The ground floor the compiler and the kernels share, NumPy only: token layouts (`layout`),
tile kinds (`kinds`), the table format (`tables`, `gpu_tables`), the kernel's VMEM need
(`vmem`), the blocks words run straight-line (`straight`) and the KV-cache ring (`ring`).

The analysis builds these objects and the generated modules load them; the Pallas kernels
(svgen.runtime) read them. Nothing here imports JAX or any other part of svgen."""
