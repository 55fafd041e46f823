"""Bundled models: ResNet-50 built in code, and simulated device profiles."""
