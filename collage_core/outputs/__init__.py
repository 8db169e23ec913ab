"""What a run leaves: the result, its report and pictures, placement files, the output folder, Model Library Format, and reuse of a finished run."""
