"""The job service's former home, kept so code written against it still imports: its names now live in the sides of
``async_inference.jobs_service``, where new code imports them from."""

from async_inference.jobs_service import DeadlineCheck as DeadlineCheck
from async_inference.jobs_service import JobResult as JobResult
from async_inference.jobs_service import JobService as JobService
from async_inference.jobs_service import NotAClaimCheck as NotAClaimCheck
from async_inference.jobs_service import ServiceError as ServiceError
from async_inference.jobs_service import Submitted as Submitted
from async_inference.jobs_service import build_notification as build_notification
from async_inference.jobs_service import describe_validation_error as describe_validation_error
from async_inference.jobs_service import parse_request_body as parse_request_body
