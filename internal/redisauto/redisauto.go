// Package redisauto sends the commands of concurrent callers to Redis in
// shared pipelines.
package redisauto

import "github.com/redis/go-redis/v9"

// Commands returns the command surface of rdb through go-redis's
// autopipeliner when the client has one (*redis.Client,
// *redis.ClusterClient): each call still blocks until its command ran, but
// commands issued meanwhile by other goroutines travel in the same
// pipeline, so that under load a request costs a share of a round trip
// instead of one (both in this process and in Redis). Otherwise it returns
// rdb. The autopipeliner is closed with its client.
func Commands(rdb redis.UniversalClient) redis.Cmdable {
	if c, ok := rdb.(interface {
		AutoPipeline() (*redis.AutoPipeliner, error)
	}); ok {
		if ap, err := c.AutoPipeline(); err == nil {
			return ap
		}
	}
	return rdb
}
