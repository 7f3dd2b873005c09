"""Hand-written code that generated kernels import (no dependency on spec/analysis)."""
