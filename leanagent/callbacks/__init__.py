"""Lightning callbacks: rank barriers, progressive training, prediction output."""
