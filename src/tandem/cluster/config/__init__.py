"""The cluster file: YAML loading with line-numbered errors, and the dataclasses it becomes."""
