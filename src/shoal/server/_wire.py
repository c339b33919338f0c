"""The pydantic models on the wire of ``/api/v1`` (they make the OpenAPI document).

``shoal.client`` decodes the same JSON into ``core`` records without pydantic; the contract
suite, run through a real server, checks that the two agree.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from shoal.core.experiments import RunStatus

__all__ = ["ArtifactIn", "ArtifactOut", "EndIn", "ExperimentIn", "ExperimentOut", "MetricsIn",
           "MetricsOut", "ParametersIn", "RunIn", "RunOut", "SummaryOut", "TagsIn",
           "VersionOut", "WhoAmIOut"]

#: A parameter keeps its JSON type: bool, int, float or str (pydantic's smart union).
Parameter = bool | int | float | str
#: One metric point: [name, value, timestamp (epoch seconds), step or null].
Point = tuple[str, float, float, int | None]


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class VersionOut(BaseModel):
    service: str = "shoal"
    api_version: int
    shoal_version: str
    auth: bool


class WhoAmIOut(BaseModel):
    user: str
    token: str
    scope: str


class ExperimentIn(BaseModel):
    display_name: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)


class ExperimentOut(_Out):
    name: str
    display_name: str | None
    created_at: datetime
    tags: dict[str, str]
    run_count: int
    owner: str


class ArtifactIn(BaseModel):
    name: str
    value: str
    media_type: str | None = None
    is_output: bool = True
    artifact_type: str | None = None


class ArtifactOut(_Out, ArtifactIn):
    pass


class RunIn(BaseModel):
    run_name: str
    display_name: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)


class RunOut(_Out):
    experiment_name: str
    run_name: str
    display_name: str | None
    status: RunStatus
    created_at: datetime
    ended_at: datetime | None
    parameters: dict[str, Parameter]
    tags: dict[str, str]
    jobs: list[str]
    artifacts: list[ArtifactOut]
    owner: str


class EndIn(BaseModel):
    status: RunStatus


class ParametersIn(BaseModel):
    parameters: dict[str, Parameter]


class TagsIn(BaseModel):
    tags: dict[str, str]


class MetricsIn(BaseModel):
    points: list[Point]


class MetricsOut(BaseModel):
    points: list[Point]


class BucketsOut(BaseModel):
    name: str
    count: int
    x_is_step: bool
    points: list[Point]


class SummaryOut(_Out):
    name: str
    count: int
    min: float
    max: float
    avg: float
    last: float
