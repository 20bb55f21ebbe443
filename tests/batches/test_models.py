"""The batch wire models beside the names other parts of the system filter on."""


def test_the_batch_events_the_push_function_is_subscribed_to_are_the_ones_published():
    """The WebSocket push function's filter (settings.BATCH_RESULT_EVENTS) names every event a batch's end publishes."""
    from async_inference import settings
    from async_inference.batches.models import BATCH_EVENTS

    assert sorted(BATCH_EVENTS.values()) == sorted(settings.BATCH_RESULT_EVENTS)
