"""Side-by-side benchmarks: each module measures anatomy and the tool a user would pick instead,
in the same run, on the same input, and prints ratios and roofline fractions."""
