"""The SageMaker backend: backend.py (plan, preflight, submit and the lifecycle), request.py (the one
CreateTrainingJob request, pure), status.py (reading DescribeTrainingJob) and entrypoint.py (the
job's one-line start inside the container); README.md describes what it runs."""
