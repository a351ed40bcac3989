// Package remoting is RocketMQ 4.x's remoting wire format, written for
// idem from the protocol's definitions (the Java broker's RequestCode,
// ResponseCode, RemotingCommand and MessageDecoder, and what the Go client
// sends): length-prefixed frames with a JSON or ROCKETMQ-serialised header
// (code, opaque, flag, remark, ext fields) and a body; the message
// properties string; the store format of pulled messages and the batch
// format of sent ones. The fake broker (internal/fakerocket) and the
// adapter's lag queries use it. Decoders never panic on malformed input
// (fuzzed) and reject what does not add up.
package remoting

// Request codes (org.apache.rocketmq.common.protocol.RequestCode).
const (
	SendMessage              = 10
	PullMessage              = 11
	QueryConsumerOffset      = 14
	UpdateConsumerOffset     = 15
	UpdateAndCreateTopic     = 17
	SearchOffsetByTimestamp  = 29
	GetMaxOffset             = 30
	GetMinOffset             = 31
	HeartBeat                = 34
	UnregisterClient         = 35
	ConsumerSendMsgBack      = 36
	GetConsumerListByGroup   = 38
	NotifyConsumerIdsChanged = 40
	LockBatchMQ              = 41
	UnlockBatchMQ            = 42
	GetRouteInfoByTopic      = 105
	DeleteTopicInBroker      = 215
	DeleteTopicInNamesrv     = 216
	SendMessageV2            = 310
	SendBatchMessage         = 320
)

// Response codes (ResponseCode, RemotingSysResponseCode).
const (
	Success                 = 0
	SystemError             = 1
	SystemBusy              = 2
	RequestCodeNotSupported = 3
	FlushDiskTimeout        = 10
	SlaveNotAvailable       = 11
	FlushSlaveTimeout       = 12
	MessageIllegal          = 13
	ServiceNotAvailable     = 14
	NoPermission            = 16
	TopicNotExist           = 17
	PullNotFound            = 19
	PullRetryImmediately    = 20
	PullOffsetMoved         = 21
	QueryNotFound           = 22
)

// Well-known property names (MessageConst).
const (
	PropertyKeys              = "KEYS"
	PropertyTags              = "TAGS"
	PropertyDelayLevel        = "DELAY"
	PropertyRetryTopic        = "RETRY_TOPIC"
	PropertyRealTopic         = "REAL_TOPIC"
	PropertyRealQueueID       = "REAL_QID"
	PropertyOriginMessageID   = "ORIGIN_MESSAGE_ID"
	PropertyUniqueKey         = "UNIQ_KEY"
	PropertyCluster           = "CLUSTER"
	PropertyWaitStoreMsgOK    = "WAIT"
	PropertyTransactionPrep   = "TRAN_MSG"
	PropertyMaxReconsumeTimes = "MAX_RECONSUME_TIMES"
)

// Topic prefixes (MixAll).
const (
	RetryTopicPrefix = "%RETRY%"
	DLQTopicPrefix   = "%DLQ%"
)

// RetryTopic and DLQTopic are a consumer group's retry and dead-letter
// topics.
func RetryTopic(group string) string { return RetryTopicPrefix + group }
func DLQTopic(group string) string   { return DLQTopicPrefix + group }

// Permission bits of a topic's queues (PermName).
const (
	PermInherit = 1
	PermWrite   = 2
	PermRead    = 4
)
