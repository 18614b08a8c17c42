"""In-process experiments: centralised and federated training, LOSO / subject k-fold, robustness."""
