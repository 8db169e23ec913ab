"""The candidates: every match of every backend's patterns over the model, and the helpers patterns read operator groups with."""
