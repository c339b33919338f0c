"""``TrainingJob``: the job behind ``estimator.latest_training_job`` (SageMaker's
``_TrainingJob``), with ``describe()`` in DescribeTrainingJob's shape."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from shoal.core.experiments import job_owner
from shoal.core.jobs import JobRecord, JobStatus, TrainingSpec
from shoal.core.secrets import mask_env
from shoal.errors import JobFailedError

if TYPE_CHECKING:
    from shoal.training._estimator import Estimator

__all__ = ["TrainingJob"]

_SAGEMAKER_STATUS = {
    JobStatus.PENDING: "InProgress", JobStatus.STARTING: "InProgress",
    JobStatus.RUNNING: "InProgress", JobStatus.STOPPING: "Stopping",
    JobStatus.COMPLETED: "Completed", JobStatus.FAILED: "Failed", JobStatus.STOPPED: "Stopped",
}
_SECONDARY = {
    JobStatus.PENDING: "Starting", JobStatus.STARTING: "Downloading",
    JobStatus.RUNNING: "Training", JobStatus.STOPPING: "Stopping",
    JobStatus.COMPLETED: "Completed", JobStatus.FAILED: "Failed", JobStatus.STOPPED: "Stopped",
}


class TrainingJob:
    """SageMaker's ``_TrainingJob``: the job behind ``estimator.latest_training_job``."""

    def __init__(self, estimator: Estimator, job_name: str) -> None:
        self.estimator = estimator
        self.name = self.job_name = job_name
        self._session = estimator.sagemaker_session

    def record(self) -> JobRecord:
        record: JobRecord = self._session.jobs.get(self.name)
        return record

    @property
    def model_data(self) -> str:
        cfg = self.record().spec.training or TrainingSpec(entry_point="")
        return cfg.model_data(self.name, str(self._session.artifacts.root))

    def wait(self, logs: bool = True) -> JobRecord:
        """Follow the job to its end; raise JobFailedError (naming it) unless it completed."""
        out = sys.stdout

        def show(chunk: bytes) -> None:
            out.write(chunk.decode(errors="replace"))
            out.flush()

        record: JobRecord = self._session.jobs.wait(self.name,
                                                    on_output=show if logs else None)
        if record.status == JobStatus.COMPLETED:
            return record
        log = self._session.jobs.log_uri(self.name)
        raise JobFailedError(
            f"training job {self.name} {record.status}: {record.failure_reason or ''}".rstrip()
            + f"\nLog: {log}", job=self.name, log_uri=log, reason=record.failure_reason,
            status=str(record.status), exit_code=record.exit_code)

    def stop(self) -> None:
        self._session.jobs.cancel(self.name)

    def describe(self) -> dict[str, Any]:
        """The job in the shape of SageMaker's DescribeTrainingJob."""
        record = self.record()
        spec = record.spec
        cfg = spec.training or TrainingSpec(entry_point="")
        out: dict[str, Any] = {
            "TrainingJobName": record.name,
            "TrainingJobStatus": _SAGEMAKER_STATUS[record.status],
            "SecondaryStatus": _SECONDARY[record.status],
            "HyperParameters": {k: v if isinstance(v, str) else json.dumps(v)
                                for k, v in cfg.hyperparameters.items()},
            "AlgorithmSpecification": {"TrainingInputMode": "File",
                                       "MetricDefinitions": [dict(d) for d in
                                                             cfg.metric_definitions]},
            "InputDataConfig": [{"ChannelName": n, "DataSource": {"S3DataSource": {
                "S3Uri": c["uri"], "S3DataType": "S3Prefix",
                "S3DataDistributionType": c.get("distribution") or "FullyReplicated"}}}
                for n, c in cfg.channels.items()],
            "OutputDataConfig": {"S3OutputPath": cfg.output_path or cfg.output_root},
            "ResourceConfig": {"InstanceType": spec.instance_type,
                               "InstanceCount": cfg.instance_count},
            "StoppingCondition": {"MaxRuntimeInSeconds": spec.max_runtime_in_seconds},
            "RetryStrategy": {"MaximumRetryAttempts": spec.max_retry_attempts},
            "Environment": mask_env(spec.environment_variables),
            "CreationTime": record.created_at,
            "LastModifiedTime": record.updated_at,
            "Tags": [{"Key": k, "Value": v} for k, v in spec.tags],
        }
        if record.started_at:
            out["TrainingStartTime"] = record.started_at
        if record.ended_at:
            out["TrainingEndTime"] = record.ended_at
        if record.duration_seconds is not None:
            out["TrainingTimeInSeconds"] = int(round(record.duration_seconds))
        if record.failure_reason:
            out["FailureReason"] = record.failure_reason
        if record.status == JobStatus.COMPLETED:
            out["ModelArtifacts"] = {"S3ModelArtifacts": self.model_data}
        if cfg.checkpoint_s3_uri:
            out["CheckpointConfig"] = {"S3Uri": cfg.checkpoint_s3_uri,
                                       "LocalPath": cfg.checkpoint_local_path}
        if spec.run is not None:
            out["ExperimentConfig"] = {"ExperimentName": spec.run.experiment_name,
                                       "RunName": spec.run.run_name}
        last: dict[str, Any] = {}
        for p in self._session.runs.get_metrics(job_owner(record.name)):
            last[p.name] = p
        out["FinalMetricDataList"] = [
            {"MetricName": n, "Value": p.value, "Timestamp": datetime.fromtimestamp(
                p.timestamp, UTC)} for n, p in sorted(last.items())]
        return out
