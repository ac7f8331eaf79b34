"""The stateless popmq proxy: apache.rocketmq.v2 MessagingService over a broker cluster."""
