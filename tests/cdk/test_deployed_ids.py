"""The stateful resources keep the logical ids they were deployed with (issue 26): a changed id makes CloudFormation
replace the resource, and a replaced queue, table, bucket, cluster or API loses what it holds or the name clients
use. The ids below are those of a synth of the code before every model became a fleet (the first model's resources
were built in the service itself then); cdk.model_fleet.deployed_names pins them."""

from __future__ import annotations

import json

import pytest

from tests.cdk.test_model_fleets import MODELS

pytestmark = pytest.mark.cdk

# The types whose replacement loses state or a name clients use.
STATEFUL = (
    "AWS::SQS::Queue",
    "AWS::ECS::Service",
    "AWS::AutoScaling::AutoScalingGroup",
    "AWS::ECS::CapacityProvider",
    "AWS::ECS::Cluster",
    "AWS::EC2::VPC",
    "AWS::EC2::Subnet",
    "AWS::DynamoDB::Table",
    "AWS::S3::Bucket",
    "AWS::KMS::Key",
    "AWS::SecretsManager::Secret",
    "AWS::SNS::Topic",
    "AWS::ApiGateway::RestApi",
    "AWS::ApiGateway::ApiKey",
    "AWS::ApiGatewayV2::Api",
)
# The default app (cdk.json's context), synthesized from the code before the refactor.
DEPLOYED = {
    "ServiceBatchesControlDeadLetterQueue13AB7CCB",
    "ServiceBatchesControlQueue2E75C9DE",
    "ServiceBatchesLaneDeadLetterQueueC543533A",
    "ServiceBatchesLaneQueue6A3CF0CF",
    "ServiceDeadLettersUnhandledEB104238",
    "ServiceJobsDeadLetterQueue90469DEA",
    "ServiceJobsQueueD9F9A685",
    "ServiceResultsSubscriptionDeadLetterQueue48095299",
    "ServiceUploadDeadlinesDeadLetterQueueE5197666",
    "ServiceUploadDeadlinesQueue77725239",
    "ServiceUploadsFailureQueueADDCC8ED",
    "ServiceWebhooksDeadLetterQueue13C26FCC",
    "ServiceWebhooksQueue504F0C0E",
    "ServiceWorkersServiceFDFF034E",
    "ServiceWorkersGpuInstancesASG46B051A0",
    "ServiceWorkersGpuCapacity0EAB9778",
    "ServiceWorkersCluster8F95AE15",
    "ServiceWorkersVpc9475B2FE",
    "ServiceWorkersVpcpublicSubnet1Subnet3FE4A982",
    "ServiceWorkersVpcpublicSubnet2Subnet768B6246",
    "ServiceWorkersVpcworkersSubnet1Subnet4D8E89FC",
    "ServiceWorkersVpcworkersSubnet2SubnetD6845F36",
    "ServiceBatchesTableCFB2965C",
    "ServiceJobTableC1537438",
    "ServicePushConnectionsAA75458C",
    "ServiceClaimChecksAccessLogsB64E2EEC",
    "ServiceClaimChecksBucket62029AB7",
    "ServiceResultsTopicKey046E3FFA",
    "ServiceWebhooksSigningSecretdemoA0813C64",
    "ServicePushJobEventTopic321EEB84",
    "ServiceResultsResultTopic0B650DAD",
    "ServiceIngestionApiF69A90EC",
    "ServiceIngestionApiApiKeydemoDD63677D",
    "ServicePushApiC922FB16",
}
# A second model's fleet (tests/cdk/test_model_fleets.py's), beside the same shared and first-model resources.
DEPLOYED_SECOND_FLEET = {
    "ServiceFleetAllMinilmL6V2JobsDeadLetterQueue58EAD7E3",
    "ServiceFleetAllMinilmL6V2JobsQueue4EE6AE0A",
    "ServiceFleetAllMinilmL6V2LaneDeadLetterQueue7FDEEF3B",
    "ServiceFleetAllMinilmL6V2LaneQueue373C0BF3",
    "ServiceFleetAllMinilmL6V2WorkersService00DE6E2B",
    "ServiceFleetAllMinilmL6V2WorkersGpuInstancesASG19F993BD",
    "ServiceFleetAllMinilmL6V2WorkersGpuCapacity72CE5A57",
}


# Stateful resources added since that deploy, each on purpose: an update creates them and replaces nothing.
ADDED = {
    "ServiceMonitoringOperationsAlarmTopic4EB03E43",  # the alarm topic every alarm notifies (issue 27)
    "ServiceJobStreamsTable79272886",  # streamed jobs' text, the job event log (issue 28)
    "ServiceWebhooksQueuedemo8D76C9AA",  # the default tenant's webhook queue (issue 30)
}
# Stateful resources replaced on purpose, with the migration docs/deploying.md gives ("Upgrading").
REPLACED = {
    "ServiceWebhooksQueue504F0C0E",  # the webhook queue all tenants shared: one per tenant since issue 30
}


def _stateful_ids(synthesized) -> set[str]:
    resources = synthesized.json["Resources"]
    return {logical_id for logical_id, resource in resources.items() if resource["Type"] in STATEFUL}


def test_the_default_apps_stateful_resources_keep_their_deployed_logical_ids(synth_variant):
    """GIVEN the default app WHEN synthesized THEN its stateful resources have exactly the logical ids deployed
    before every model became a fleet, less those replaced on purpose (REPLACED, each with its migration), and those
    added since on purpose."""
    assert _stateful_ids(synth_variant()) == (DEPLOYED - REPLACED) | ADDED


def test_a_second_models_fleet_keeps_its_deployed_logical_ids(synth_variant):
    """GIVEN a chat and an embedding model WHEN synthesized THEN the stateful resources are the default app's and the
    second model's fleet's, as deployed."""
    assert (
        _stateful_ids(synth_variant(models=json.dumps(MODELS))) == (DEPLOYED - REPLACED) | DEPLOYED_SECOND_FLEET | ADDED
    )


def test_the_first_models_weights_bucket_keeps_its_deployed_logical_id(synth_variant):
    """GIVEN weights from S3 in a bucket the stack creates WHEN synthesized THEN that bucket keeps its deployed id."""
    buckets = synth_variant(model_source="s3").resources("AWS::S3::Bucket")
    assert "ServiceModelsBucket59642331" in buckets
