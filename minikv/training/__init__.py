"""Training the shipped model (`python -m minikv train`): the phases, the data, the seed."""
