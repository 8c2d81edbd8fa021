"""`python -m minikv probe URL --key KEY_A --key KEY_B`: black-box isolation checks through an endpoint's
OpenAI-compatible API and two keys the user owns, so they run against minikv, vLLM, SGLang or a hosted
provider (docs/serve.md, "The probe"). command.py reads the command line, run.py runs the checks."""
